"""HTTP below both daemons: the lean HTTP/1.1 client (http1.py), the httpx transport over aiohttp
(transport.py), bodies bounded after decoding (bodies.py) and the addresses a request may reach (targets.py).

It imports nothing from the daemons or the resolvers: the worker, the master's robots.txt fetch and the resolvers
all build on it.
"""
