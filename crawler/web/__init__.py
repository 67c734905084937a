"""The web layer: what the crawler knows about URLs, pages and media, below both daemons and the resolvers.

``urls`` joins, normalises and parses URLs (host, origin) and holds the URL policy; ``links`` finds the links a
page offers; ``media`` tells audio from other content by extension, media type, first bytes and tags, and reads
playlists; ``page`` is a fetched response; ``html`` runs CSS queries and the page-size prechecks. Nothing here
does I/O or imports a daemon.
"""
