from crackseg.cli.launch import exit_status, said_already

if (status := said_already()) is not None:  # torchrun restarted this launch's processes after one said why: said once
    raise SystemExit(status)

from crackseg.cli.main import main  # noqa: E402

raise SystemExit(exit_status(main))
