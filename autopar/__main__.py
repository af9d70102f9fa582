from autopar.cli import main

main()
