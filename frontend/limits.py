"""The front end's limits on its input (docs/language.md, "Limits and bad input"). Input past
one is a located diagnostic, given before the work that the input would cost."""

MAX_SOURCE_BYTES = 2 ** 20        # one source file, in UTF-8 (the parser reads some 100 KB a second)
MAX_NESTING = 200                 # brackets, blocks, lambdas and operators within one another
MAX_RANK = 64                     # dimensions of a tensor (NumPy's limit)
MAX_STATIC_RECURSION = 256        # calls and forks unrolled within one another at compile time
MAX_UNROLLED = 10_000             # calls, forks and steps of folds over lists unrolled in all,
                                  # by the check or a specialisation of one function
MAX_DIAGNOSTICS = 100             # errors reported; a note on the last counts the others
MAX_EXCERPT = 160                 # characters of a source line shown under a diagnostic
