from elastic_hydra.cli.entry import main

main()
