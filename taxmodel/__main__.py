from taxmodel.cli import main

main()
