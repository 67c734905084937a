"""The test harness, shared by the test suite and the demo and benchmarks in scripts/: the real daemons started
as local processes (cluster), the generated demo sites (sitegen, sitegen_named) and their server (siteserver), a
site for politeness measurements (politesite), a throwaway PostgreSQL cluster (pgcluster).

It imports nothing from scripts/ (the entry points import it) and is not part of the installed package."""
