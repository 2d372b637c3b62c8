"""A test MCP "server" (issue 33) that never speaks MCP: it complains on stderr, naming its $BAD_TOKEN (the host
must blot it out), and exits with status 3."""

import os
import sys

print("bad_start: cannot read my settings file", file=sys.stderr, flush=True)
print(f"bad_start: the token was {os.environ.get('BAD_TOKEN', '')}", file=sys.stderr, flush=True)
sys.exit(3)
