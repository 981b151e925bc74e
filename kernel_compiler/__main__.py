from kernel_compiler.cli import main

main()
