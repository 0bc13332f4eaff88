"""A small stdio MCP server (the official SDK's low-level ``Server``) that serves one BFCL
multi-turn task's backends: the task's involved classes (GorillaFileSystem, MathAPI, ...)
loaded with its initial configuration exactly as ``heart.environments.bfcl`` loads them, each
method a tool with BFCL's documented schema as ``inputSchema`` and its class as
``_meta.category``. A method's ``{"error": ...}`` answer is an ``isError`` result.

    python tests/servers/bfcl_mcp_server.py --task multi_turn_base_1 [--fault die|hang|garbage --on TOOL]

Faults (for the failure tests): on a call to TOOL, ``die`` exits the process, ``hang`` never
answers, ``garbage`` writes a line that is not JSON-RPC and a response that is not a tool
result, then never answers.
"""

from __future__ import annotations

import argparse
import json
import os

import anyio
import mcp.types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from heart.environments.base import ToolExecutionError
from heart.environments.bfcl import BFCLEnvironment


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", required=True)
    parser.add_argument("--fault", choices=["die", "hang", "garbage"])
    parser.add_argument("--on", help="the tool whose call triggers the fault")
    args = parser.parse_args(argv)

    environment = BFCLEnvironment()
    session = environment.start(environment.load_task(args.task))
    session.start_turn(0)  # the session logs calls under a turn; the client keeps the real log
    tools = {tool.name: tool for tool in session.tools}
    # The SDK moves fd 1 aside (stray prints go to stderr); garbage must reach the wire itself.
    wire = os.dup(1)

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name=t.name, description=t.spec.description, input_schema=t.spec.parameters,
                       _meta={"category": t.spec.category})
            for t in tools.values()])

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if args.fault and params.name == args.on:
            if args.fault == "die":
                os._exit(3)
            if args.fault == "garbage":
                reply = {"jsonrpc": "2.0", "id": ctx.request_id, "result": {"content": "not a list", "isError": 7}}
                os.write(wire, b"this is not JSON-RPC\n" + (json.dumps(reply) + "\n").encode())
            await anyio.sleep(3600)  # hang (garbage: the real answer never comes either)
        tool = tools.get(params.name)
        if tool is None:
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"unknown tool {params.name!r}")],
                                        is_error=True)
        try:
            result = tool.fn(**(params.arguments or {}))
        except ToolExecutionError as err:
            return types.CallToolResult(content=[types.TextContent(type="text", text=str(err))], is_error=True)
        except TypeError as err:  # arguments the method does not take
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"TypeError: {err}")],
                                        is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(result))])

    server = Server("bfcl-backends", on_list_tools=list_tools, on_call_tool=call_tool)

    async def serve() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(serve)


if __name__ == "__main__":
    main()
