from elastic_hydra.cli import main

main()
