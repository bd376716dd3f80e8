from imagegen.cli import main

raise SystemExit(main())
