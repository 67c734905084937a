"""The web layer: what the crawler knows about URLs, pages and media, below both daemons and the resolvers.

``urls`` joins, normalises and parses URLs (host, origin) and holds the URL policy; ``links`` finds the links a
page offers; ``media`` tells audio from other content by extension, media type and first bytes; ``page`` is a
fetched response. Nothing here does I/O or imports a daemon.
"""
