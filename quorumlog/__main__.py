from quorumlog.cli.main import main

main()
