from stack.cli import main

main()
