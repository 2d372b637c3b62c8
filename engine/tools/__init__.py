"""Tools from Model Context Protocol servers (issue 33): the servers a person configured (``config.py``), the
running servers and their calls (``host.py``'s ToolHost, its records and limits in ``specs.py``, its machinery
on the official ``mcp`` SDK in ``sessions.py``, ``connection.py`` and ``listing.py``, loaded only when a host
starts), a call's result as the text the model reads (``results.py``), and the tool loop of a chat turn
(``loop.py``). Front ends reach them through engine/api.py."""
