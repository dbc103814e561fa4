"""``crackseg COMMAND``: the command line, argparse only, no logic.

One module per command group (data: synth, inspect; train: convert, train; predict: predict,
export, report; labels; compare; evaluate), each adding its sub-parsers and holding its
``_cmd_*`` functions; ``options.py`` holds the flags, argparse types and checks they share;
``main.py`` builds the parser and turns errors into exit statuses (the ``crackseg`` entry point).

May import any crackseg package; the features themselves only lazily, inside the command
functions, so that commands that need no torch (compare, labels, inspect) start without it.
"""
