from crawler.worker.cli import main

# Guarded: the fingerprint pool's spawned processes import this module again (as __mp_main__), and must not run
# a worker of their own.
if __name__ == "__main__":
    main()
