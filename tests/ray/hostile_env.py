"""A user's calculator environment whose tool misbehaves in every way a tool can, for
tests/ray/test_user_code_in_runs.py. Which way depends only on the expression (its CRC), so a run is repeatable."""

import ctypes
import os
import time
import zlib

from agentrl_ray.envs.builtin.calculator import CalculatorEnv


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("this value cannot be turned into text")

    __repr__ = __str__


class HostileCalculator(CalculatorEnv):
    WAYS = ("exit", "system_exit", "hang", "segfault", "unprintable", "keyboard_interrupt", "fine", "fine")

    def calculator(self, expression: str) -> str:
        way = self.WAYS[zlib.crc32(expression.encode()) % len(self.WAYS)]
        if way == "exit":
            os._exit(3)
        if way == "system_exit":
            raise SystemExit(2)
        if way == "hang":
            time.sleep(3600)
        if way == "segfault":
            ctypes.string_at(0)
        if way == "unprintable":
            return Unprintable()
        if way == "keyboard_interrupt":
            raise KeyboardInterrupt
        return super().calculator(expression)

    calculator.__doc__ = CalculatorEnv.calculator.__doc__  # the same tool schema as the model was trained on
