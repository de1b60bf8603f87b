from outpace.cli import main

main()
