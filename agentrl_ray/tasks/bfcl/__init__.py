"""BFCL v4 (the Berkeley Function Calling Leaderboard) as a training task: its single-turn tasks as prompt rows with
a fixed train/held-out split (`data`), and our own implementation of its AST checker's rules (`matcher`).

The environment and the reward function that judge a completion with the matcher live with the example that uses
them, `examples/bfcl/` (this folder is a foundation: it imports nothing of the package).
"""
