from elastic_hydra.entry import main

main()
