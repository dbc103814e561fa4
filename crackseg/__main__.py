from crackseg.cli import main

raise SystemExit(main())
