from toolsd.cli import main

raise SystemExit(main())
