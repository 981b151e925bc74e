from loader.cli import main

main()
