"""A distributed crawler that finds and collects audio."""
