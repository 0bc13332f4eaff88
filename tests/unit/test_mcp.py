"""HEART's MCP face, with real processes and the official SDK on both sides.

- ``heart mcp serve`` over stdio, driven by the SDK's own ``ClientSession`` + ``stdio_client``:
  it lists its three tools with JSON schemas, searches ToolFace, calls a primitive against a
  task's live state, solves a BFCL task with the gold teacher (valid by BFCL's checker), and
  answers malformed input with MCP errors while it keeps serving;
- over streamable HTTP it binds 127.0.0.1 (read from /proc/net/tcp) and answers tools/list,
  also to the environment side's client (``MCPClient`` over ``HttpServer``);
- an MCP environment (heart/environments/mcp.py) runs a gold episode against a real stdio
  MCP server (tests/servers/bfcl_mcp_server.py, BFCL's own backends), scored by BFCL's
  checker; a server that dies, hangs or answers garbage gives a FAILURE envelope in bounded
  time, and an episode over a dying server ends instead of hanging;
- in-process: the Primitive role resolving a request (scripted backend), result and schema
  conversion, the CLI's checks.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

anyio = pytest.importorskip("anyio")
pytest.importorskip("mcp")
from mcp import ClientSession, StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402

from heart.environments.bfcl import BFCLEnvironment  # noqa: E402
from heart.environments.base import ToolExecutionError  # noqa: E402
from heart.environments.mcp import (  # noqa: E402
    HttpServer,
    MCPClient,
    MCPEnvironment,
    MCPServerError,
    StdioServer,
    tool_result,
    tool_spec,
)
from heart.episode import run_episode  # noqa: E402
from heart.primitives import RUNTIME_ERROR, SCHEMA_RESOLUTION, execute  # noqa: E402
from heart.runtime.scripted import ScriptedBackend  # noqa: E402
from heart_distill.data.gold_teacher import GoldTeacher  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEST_SERVER = REPO / "tests" / "servers" / "bfcl_mcp_server.py"
TASK = "multi_turn_base_1"
"""A BFCL test-split task over GorillaFileSystem: four turns, ls / cd / mv / grep / tail."""


def child_env() -> dict[str, str]:
    """What a server process needs beyond the SDK's default environment (HOME, PATH, ...)."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false"}
    for name in ("HEART_CACHE", "BFCL_PROJECT_ROOT"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def heart_mcp(*args: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "heart_distill.cli", "mcp", "serve", *args],
                                 env=child_env(), cwd=str(REPO))


def payload(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def error_text(result) -> str:
    assert result.is_error, result
    return result.content[0].text


@pytest.fixture(scope="module")
def bfcl():
    return BFCLEnvironment()


SEARCHES = [("list all the visible and hidden contents in the current directory", None, None),
            ("list all the visible and hidden contents in the current directory", TASK, 3),
            ("show the last lines of a file", None, 2)]


@pytest.fixture(scope="module")
def warm_toolface(bfcl):
    """ToolFace's on-disk caches (MiniLM embeddings, faiss indexes) hold what the servers
    below will search, as after any earlier BFCL run on this machine: on a cold cache,
    embedding BFCL's catalog and train query log takes ~40 s on 2 cores, once per machine,
    and is paid here rather than inside a server's first answer."""
    from heart.mcp import HeartMCP

    heart = HeartMCP(bfcl, lambda task: GoldTeacher(task, bfcl.catalog()), gold=True)
    for query, task_id, k in SEARCHES:
        heart.toolface_search(query, task_id, k)
    assert heart.solve(TASK)["success"]


# -- heart mcp serve over stdio ------------------------------------------------------------
def test_stdio_server_lists_searches_calls_solves_and_refuses_malformed_input(warm_toolface):
    async def scenario():
        async with stdio_client(heart_mcp("--env", "bfcl", "--model", "gold")) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = {t.name: t for t in (await session.list_tools()).tools}
                assert set(tools) == {"toolface_search", "call_primitive", "solve"}
                for tool in tools.values():
                    assert tool.description and tool.input_schema["type"] == "object"
                assert tools["call_primitive"].input_schema["required"] == ["task_id", "tool"]
                assert tools["call_primitive"].input_schema["properties"]["arguments"]["anyOf"][0]["type"] == "object"

                # ToolFace: the whole catalog, and one task's own tools as its Planner sees them
                query = SEARCHES[0][0]
                found = payload(await session.call_tool("toolface_search", {"query": query}))
                assert found["catalog_size"] > 100
                assert "ls" in [t["name"] for t in found["tools"][:3]]
                assert all(t["description"] and "\n" not in t["description"] for t in found["tools"])
                scoped = payload(await session.call_tool("toolface_search", {"query": query, "task_id": TASK, "k": 3}))
                assert scoped["catalog_size"] < found["catalog_size"]
                assert scoped["tools"][0]["name"] == "ls" and scoped["tools"][0]["category"] == "GorillaFileSystem"

                # a primitive against the task's live state: kept between calls, reset on demand
                call = {"task_id": TASK, "tool": "cd", "arguments": {"folder": "workspace"}}
                moved = payload(await session.call_tool("call_primitive", call))
                assert moved["status"] == "SUCCESS" and moved["bound_arguments"] == {"folder": "workspace"}
                listed = payload(await session.call_tool("call_primitive", {"task_id": TASK, "tool": "ls",
                                                                            "arguments": {}}))
                assert "log.txt" in listed["result"]["current_directory_content"]
                fresh = payload(await session.call_tool("call_primitive", {"task_id": TASK, "tool": "ls",
                                                                           "arguments": {}, "reset": True}))
                assert fresh["result"] == {"current_directory_content": ["workspace"]}
                unknown = payload(await session.call_tool("call_primitive", {"task_id": TASK, "tool": "cd",
                                                                             "arguments": {"bogus": 1}}))
                assert unknown["status"] == "FAILURE" and unknown["failure_type"] == SCHEMA_RESOLUTION
                missing = payload(await session.call_tool("call_primitive", {"task_id": TASK, "tool": "cd",
                                                                             "arguments": {"folder": "nowhere"}}))
                assert missing["failure_type"] == RUNTIME_ERROR and "nowhere" in missing["details"]

                # solve: the HEART loop with the gold teacher, judged by BFCL's own checker
                solved = payload(await session.call_tool("solve", {"task_id": TASK}))
                assert solved["success"] is True and solved["score"] == 1.0 and not solved["errored"]
                assert len(solved["turns"]) == 4 and all(t["verdict"] == "PASS" for t in solved["turns"])
                assert solved["answer"].startswith("tail:")
                assert {row["role"] for row in solved["trace"]} == {"planner", "router", "primitive", "verifier"}
                assert "messages" not in solved["trace"][0]

                # malformed input: an MCP error naming the problem, and the server keeps serving
                bad = [
                    ("solve", {"task_id": "no_such_task"}, "no_such_task"),
                    ("solve", {"task_id": TASK, "request": "do something"}, "gold teacher"),
                    ("call_primitive", {"task_id": TASK, "tool": "cd"}, "request, arguments, or both"),
                    ("call_primitive", {"task_id": TASK, "tool": "cd", "arguments": "folder=x"}, "valid dictionary"),
                    ("call_primitive", {"task_id": TASK, "tool": "launch", "arguments": {}}, "has no tool 'launch'"),
                    ("call_primitive", {"task_id": TASK, "tool": "ls", "arguments": {}, "turn": 9}, "turns 0..3"),
                    ("call_primitive", {"tool": "ls"}, "task_id"),
                    ("toolface_search", {"query": "files", "k": 0}, "greater than or equal to 1"),
                    ("no_such_tool", {}, "Unknown tool"),
                ]
                for name, arguments, expected in bad:
                    assert expected in error_text(await session.call_tool(name, arguments)), (name, arguments)
                assert len((await session.list_tools()).tools) == 3

    anyio.run(scenario)


# -- heart mcp serve over streamable HTTP --------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening_addresses(port: int) -> set[str]:
    """Local addresses with a socket listening on ``port`` (Linux /proc/net/tcp, tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                if len(address) == 8:  # IPv4, little-endian
                    found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
                else:
                    found.add(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening address from /proc/net/tcp")
def test_http_transport_binds_loopback_and_lists_tools(tmp_path, warm_toolface):
    port = free_port()
    log = open(tmp_path / "server.log", "w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "heart_distill.cli", "mcp", "serve", "--env", "bfcl", "--model", "gold",
         "--transport", "http", "--port", str(port)],
        cwd=REPO, env={**os.environ, **child_env()}, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 25
        while not listening_addresses(port):
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "the HTTP server did not start listening"
            time.sleep(0.2)
        assert listening_addresses(port) == {"127.0.0.1"}

        async def scenario():
            async with streamable_http_client(f"http://127.0.0.1:{port}/mcp") as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    return sorted(t.name for t in (await session.list_tools()).tools)

        assert anyio.run(scenario) == ["call_primitive", "solve", "toolface_search"]
        # the environment side's client over HTTP: heart's own tools, called like any MCP tools
        with MCPClient(HttpServer(f"http://127.0.0.1:{port}/mcp"), call_timeout_s=20) as client:
            assert client.server_name == "heart"
            found = client.call_tool("toolface_search", {"query": SEARCHES[2][0], "k": SEARCHES[2][2]})
            assert found["tools"][0]["name"] == "tail"
            with pytest.raises(ToolExecutionError, match="no BFCL multi_turn_base task") as raised:
                client.call_tool("solve", {"task_id": "nope"})
            assert not isinstance(raised.value, MCPServerError)
        assert f"http://127.0.0.1:{port}/mcp" in (tmp_path / "server.log").read_text()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


# -- an MCP server as a HEART environment -------------------------------------------------
def bfcl_server(*fault: str):
    """A per-task server: the test server started in the task's initial state."""
    def server(task):
        return StdioServer(sys.executable, (str(TEST_SERVER), "--task", task.task_id, *fault), env=child_env(),
                           cwd=str(REPO))
    return server


def test_mcp_environment_runs_a_gold_episode_scored_by_the_bfcl_checker(bfcl, warm_toolface):
    environment = MCPEnvironment(bfcl_server(), benchmark=bfcl, task_ids=[TASK])
    assert environment.task_ids() == [TASK] and environment.task_ids("test") == [TASK]
    assert environment.task_ids("train") == []
    task = environment.load_task(TASK)
    assert task.env == "mcp" and task.gold == bfcl.load_task(TASK).gold
    # the tools as the server lists them: BFCL's own schemas, its classes as categories
    specs = {spec.name: spec for spec in environment.catalog()}
    local = {tool.name: tool.spec for tool in bfcl.start(bfcl.load_task(TASK)).tools}
    assert specs == local

    result = run_episode(environment, task, GoldTeacher(task, environment.catalog()))
    record = result.record
    assert not record.errored, record.error
    assert record.success and record.score == 1.0, record.checker
    assert record.checker["scored_by"].startswith("bfcl checker")
    # what went over MCP is what BFCL's checker judged: a wrong call would fail it
    assert all(t.verdict == "PASS" for t in result.turns)


@pytest.mark.parametrize("fault, expected", [
    ("die", "closed the connection"),
    ("hang", "did not answer tools/call 'ls' within 2s"),
    ("garbage", "malformed result"),
])
def test_a_failing_server_gives_a_failure_envelope_in_bounded_time(bfcl, fault, expected):
    environment = MCPEnvironment(bfcl_server("--fault", fault, "--on", "ls"), benchmark=bfcl, task_ids=[TASK],
                                 call_timeout_s=2.0)
    session = environment.start(environment.load_task(TASK))
    try:
        session.start_turn(0)
        tools = {tool.name: tool for tool in session.tools}
        start = time.monotonic()
        envelope = execute(tools["ls"], {}, timeout_s=60.0)
        # the connection's own 2 s timeout answers, well before the call's 60 s (a hanging
        # server never answers); the bound is generous so that it does not depend on speed
        assert time.monotonic() - start < 30
        assert envelope.status == "FAILURE" and envelope.failure_type == RUNTIME_ERROR
        assert "MCPServerError" in envelope.details and expected in envelope.details
        after = execute(tools["pwd"], {}, timeout_s=10.0)
        if fault == "die":  # nothing left to answer: later calls fail at once, saying so
            assert after.failure_type == RUNTIME_ERROR and "not connected" in after.details
        else:  # the server is alive: the connection still serves other calls
            assert after.ok and after.result == {"current_working_directory": "/alex"}
        assert [call.name for call in session.executed_calls()[0]] == ["ls", "pwd"]
    finally:
        session.close()


def test_an_episode_over_a_dying_server_ends_errored(bfcl, warm_toolface):
    """The gold calls were right, so BFCL's checker alone would pass the episode: the dead
    server is what makes it prove nothing, and the record says so (errored, not scored)."""
    environment = MCPEnvironment(bfcl_server("--fault", "die", "--on", "ls"), benchmark=bfcl, task_ids=[TASK],
                                 call_timeout_s=2.0)
    task = environment.load_task(TASK)
    start = time.monotonic()
    record = run_episode(environment, task, GoldTeacher(task, bfcl.catalog())).record
    assert time.monotonic() - start < 25
    assert record.errored and not record.success and record.score == 0.0
    assert record.error.startswith("tool: MCP server:") and "closed the connection" in record.error


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(MCPServerError, match="cannot connect to the MCP server"):
        MCPEnvironment(StdioServer(sys.executable, ("-c", "import sys; sys.exit(3)")), connect_timeout_s=10).catalog()


# -- in-process pieces ----------------------------------------------------------------------
def test_tool_results_and_schemas_convert():
    from mcp.types import CallToolResult, ImageContent, TextContent, Tool

    def result(*blocks, **fields):
        return CallToolResult(content=list(blocks), **fields)

    assert tool_result("t", result(TextContent(type="text", text='{"a": [1, 2]}'))) == {"a": [1, 2]}
    assert tool_result("t", result(TextContent(type="text", text="plain words"))) == "plain words"
    assert tool_result("t", result(TextContent(type="text", text="x"), structured_content={"k": 1})) == {"k": 1}
    assert tool_result("t", result()) is None
    image = tool_result("t", result(ImageContent(type="image", data="QUJD" * 100, mime_type="image/png")))
    assert image["data"] == "<400 base64 characters>"
    with pytest.raises(Exception, match="disk is full") as raised:
        tool_result("t", result(TextContent(type="text", text="disk is full"), is_error=True))
    assert not isinstance(raised.value, MCPServerError)  # the tool's own failure, not the server's
    with pytest.raises(MCPServerError, match="not a tool result"):
        tool_result("t", {"content": []})

    spec = tool_spec(Tool(name="t", title="Title only", input_schema={"type": "object"}), "server")
    assert spec.description == "Title only" and spec.parameters == {"type": "object", "properties": {}}
    assert spec.category == "server"
    spec = tool_spec(Tool(name="t", description="d", input_schema={"type": "object"}, _meta={"category": "C"}))
    assert spec.category == "C"


def test_call_primitive_resolves_a_request_with_the_primitive_role(bfcl):
    from heart.mcp import HeartMCP, MCPInputError

    answers = iter([
        json.dumps({"tool": "cd", "arguments": {"folder": "workspace"}}),
        json.dumps({"status": "UNRESOLVABLE", "tool": "cd", "reason": "no folder is named"}),
        "not json at all",
    ])
    seen = []

    def responder(role, messages):
        seen.append((role, messages[-1]["content"]))
        return next(answers)

    backend = ScriptedBackend(responder)
    heart = HeartMCP(bfcl, lambda task: backend, split="test")
    moved = heart.call_primitive(TASK, "cd", request="Go into the workspace folder.")
    assert moved["status"] == "SUCCESS" and moved["resolved_by"] == "primitive role"
    assert moved["bound_arguments"] == {"folder": "workspace"} and "primitive_output" in moved
    assert seen[0][0] == "primitive" and "Go into the workspace folder." in seen[0][1]
    refused = heart.call_primitive(TASK, "cd", request="Go somewhere.")
    assert refused["status"] == "FAILURE" and refused["failure_type"] == SCHEMA_RESOLUTION
    assert refused["details"] == "no folder is named"
    garbled = heart.call_primitive(TASK, "cd", request="Go somewhere.", arguments={"folder": "x"})
    assert garbled["failure_type"] == SCHEMA_RESOLUTION and "unreadable primitive output" in garbled["details"]
    with pytest.raises(MCPInputError, match="test split"):
        heart.call_primitive("multi_turn_base_0", "ls", arguments={})
    heart.close()


def test_cli_checks_mcp_arguments(capsys):
    from heart_distill.cli import build_parser

    args = build_parser().parse_args(["mcp", "serve", "--env", "agentdojo", "--model", "gold", "--transport", "http"])
    assert (args.transport, args.host, args.port, args.env) == ("http", "127.0.0.1", 8765, "agentdojo")
    for argv in (["mcp", "serve", "--port", "0"], ["mcp", "serve", "--transport", "sse"], ["mcp"]):
        with pytest.raises(SystemExit) as exit_:
            build_parser().parse_args(argv)
        assert exit_.value.code == 2
    assert "--port" in capsys.readouterr().err
