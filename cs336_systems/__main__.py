from cs336_systems.cli import main

raise SystemExit(main())
