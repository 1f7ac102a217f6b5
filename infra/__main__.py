from infra.cli.app import main

main()
