"""One file per ``sglpatch`` verb: its arguments (``register``) and its door onto the library
(``run``). ``sglpatch.cli`` lists them in the order ``sglpatch --help`` shows them; what they share
is in ``sglpatch.cli_options``."""
