"""Resolvers turn pages and site ids into real audio addresses plus metadata.

Enable them by name in the worker config, each with its own section; the generic sniffer always runs last.
"""

from crawler.resolvers.base import (
    Resolution,
    ResolveContext,
    Resolver,
    ResolverConfigError,
    parse_section,
)
from crawler.resolvers.registry import load_resolvers, pick

__all__ = ["Resolution", "ResolveContext", "Resolver", "ResolverConfigError",
           "load_resolvers", "parse_section", "pick"]
