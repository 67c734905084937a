from crawler.worker.cli import main

main()
