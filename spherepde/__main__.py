from spherepde.cli import main

raise SystemExit(main())
