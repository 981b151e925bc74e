from dse.cli import main

main()
