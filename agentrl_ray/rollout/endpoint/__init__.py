"""Bring your own agent: the rollout engines behind an OpenAI-compatible endpoint, and the user's agent program run
against it, one process per trajectory (docs/openai_agent.md).

- `calls.py`: tokens in: a request's messages to prompt ids, continuing the exact ids of earlier calls;
- `server.py`: `/v1/chat/completions` on the rollout node, batching every trajectory's calls into engine calls;
- `stitch.py`: a trajectory's recorded calls to training sequences (one, or one per rewritten history);
- `agents.py`, `child.py`: the agent processes (deadlines, crashes) and their trajectories.
"""
