from spec_cli.cli.app import main

main()
