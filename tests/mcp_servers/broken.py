"""A hand-written MCP server for the tests (issue 33) that breaks the protocol on purpose (the SDK would not let
a server do this). It speaks newline-delimited JSON-RPC on stdio:

* ``garbage`` answers with a line that is not JSON; ``bad_result`` with a result that is not a tool result;
  ``rpc_error`` with a JSON-RPC error; ``ok`` properly.
* Its listing carries odd tools: a dotted name, a 100-character name, a schema that is not an object schema,
  a 10,000-character description and a 70 KiB schema.
* ``--garbage``: every request is answered with a line that is not JSON (a start that fails).
* ``--many N``: it lists N plain tools instead.
"""

import json
import sys

SCHEMA = {"type": "object", "properties": {}}


def tools() -> list[dict]:
    if "--many" in sys.argv:
        count = int(sys.argv[sys.argv.index("--many") + 1])
        return [{"name": f"t{i}", "description": f"tool {i}", "inputSchema": SCHEMA} for i in range(count)]
    plain = [{"name": name, "description": f"answers {name}", "inputSchema": SCHEMA}
             for name in ("ok", "garbage", "bad_result", "rpc_error", "odd.name")]
    fat = {"type": "object", "properties": {"x": {"type": "string", "description": "y" * 70_000}}}
    return plain + [
        {"name": "n" * 100, "description": "a long name", "inputSchema": SCHEMA},
        {"name": "not_object", "description": "a string schema", "inputSchema": {"type": "string"}},
        {"name": "long_description", "description": "d" * 10_000, "inputSchema": SCHEMA},
        {"name": "fat_schema", "description": "a 70 KiB schema", "inputSchema": fat},
    ]


def send(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict) -> None:
    rid, method = request.get("id"), request.get("method")
    if "--garbage" in sys.argv:
        sys.stdout.write("{this is not json\n")
        sys.stdout.flush()
    elif method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {
            "protocolVersion": request["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "broken", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": tools()}})
    elif method == "tools/call":
        name = request["params"]["name"]
        if name == "garbage":
            sys.stdout.write("<html>this is not JSON-RPC</html>\n")
            sys.stdout.flush()
        elif name == "bad_result":
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": "not a list of blocks"}})
        elif name == "rpc_error":
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32603, "message": "the database is on fire"}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"{name}: fine"}]}})
    else:  # server/discover among them: this server is of the handshake era
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"Method not found: {method}"}})


def main() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if "id" in request and "method" in request:
            answer(request)


if __name__ == "__main__":
    main()
