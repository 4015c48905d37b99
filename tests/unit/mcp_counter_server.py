"""A stateful MCP tool server for the tests (the `mcp` SDK's MCPServer over stdio): `count` answers 1, 2, 3, ...
per server process, so two trajectories that each get their own server each count from 1."""

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("counter")
calls = 0


@server.tool()
def count(step: int = 1) -> int:
    """Add `step` to this server's counter and return it."""
    global calls
    if step < 1:
        raise ToolError(f"step must be at least 1, got {step}")
    calls += step
    return calls


if __name__ == "__main__":
    server.run()
