"""A reward function that fails on every sample, for tests/ray/test_deliberate_stop.py. Loaded by the rollout workers
by its import path (`tests.ray.failing_reward:always_fails`: Ray puts the driver's working directory, the
repository root under pytest, on every worker's sys.path). Each call first appends how many completions it was asked
to score to the file named by AGENTRL_TEST_SCORED, so the test can count the rollouts that were scored."""

import os


def always_fails(completions, **kwargs):
    with open(os.environ["AGENTRL_TEST_SCORED"], "a") as f:
        f.write(f"{len(completions)}\n")
    raise ValueError("this reward function always fails")
