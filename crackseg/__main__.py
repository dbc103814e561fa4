from crackseg.cli.main import main

raise SystemExit(main())
