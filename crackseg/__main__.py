from crackseg.cli.launch import exit_status, said_already

if said_already():  # torchrun restarted this launch's processes after one stopped on a user mistake: said once
    raise SystemExit(2)

from crackseg.cli.main import main  # noqa: E402

raise SystemExit(exit_status(main))
