"""An MCP tool server (the `mcp` SDK's own MCPServer, over stdio) with one tool: the built-in calculator.

    python -m examples.mcp_calculator.server      # speaks MCP on stdin/stdout; the trainer starts it per trajectory

`config.yaml` trains the calculator task with this server as the only tool provider (`env.mcp_servers`), the tool
the same as CalculatorEnv's: what differs is only where it runs, a subprocess per trajectory reached over MCP.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from agentrl_ray.envs.builtin.calculator import evaluate, format_number

server = MCPServer("calculator")


@server.tool()
def calculator(
    expression: Annotated[str, Field(description='The expression to evaluate, e.g. "(347 * 29) - 12.5".')],
) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports + - * / // % ** (exponent at most 100), parentheses, unary minus, integers and decimals.
    """
    try:
        return format_number(evaluate(expression))
    except ValueError as e:  # ToolError: an is_error result with the reason (any other error's text is withheld)
        raise ToolError(str(e)) from None


if __name__ == "__main__":
    server.run()
