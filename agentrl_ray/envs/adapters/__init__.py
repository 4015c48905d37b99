"""Environments of other libraries behind our contract (`envs.base`), one file each: `skyrl_gym` (SkyRL Gym)."""
