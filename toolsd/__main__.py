from toolsd.cli.main import main

raise SystemExit(main())
