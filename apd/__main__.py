from apd.cli import main

raise SystemExit(main())
