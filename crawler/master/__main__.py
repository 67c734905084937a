from crawler.master.cli import main

main()
