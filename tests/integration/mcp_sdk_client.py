# SPDX-License-Identifier: Apache-2.0
"""The official MCP Python SDK against onceq's /mcp (tests/integration/test_mcp_sdk.sh):
connect over Streamable HTTP, list the tools with their schemas, call "charge" twice with the
same key (_meta), print a JSON summary."""
import asyncio
import json
import sys

try:
    from mcp.client.streamable_http import streamable_http_client as connect
except ImportError:  # the 1.x name
    from mcp.client.streamable_http import streamablehttp_client as connect
from mcp import ClientSession


async def main(url):
    async with connect(url) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            init = await s.initialize()
            tools = (await s.list_tools()).tools
            meta = {"io.onceq/idempotency-key": "sdk-charge-1"}
            r1 = await s.call_tool("charge", {"amount": 11}, meta=meta)
            r2 = await s.call_tool("charge", {"amount": 11}, meta=meta)
            d = lambda o: o.model_dump(mode="json", by_alias=True, exclude_none=True)
            init, r1, r2 = d(init), d(r1), d(r2)
            print(json.dumps({
                "server": init["serverInfo"]["name"],
                "version": init["protocolVersion"],
                "tools": {t["name"]: {"schema": t["inputSchema"],
                                      "idempotent": t.get("annotations", {}).get("idempotentHint")}
                          for t in map(d, tools)},
                "r1": {"isError": r1.get("isError"), "sc": r1.get("structuredContent")},
                "r2": {"isError": r2.get("isError"), "sc": r2.get("structuredContent")},
            }))


asyncio.run(main(sys.argv[1]))
