"""The MPI message tags the package sends with: one table, so no two uses meet.

The ring steps of the MPI backend tag their messages with the step's segment index (0, 1, ...)
on the backend's own duplicated communicators, far below these.
"""
CHECK_TAG = 7301    # the argument check: a member's call hash to the first member (rendezvous)
VERDICT_TAG = 7302  # the argument check: the first member's verdict back (rendezvous)
EXIT_TAG = 7303     # "this rank has gone", on MPI_COMM_WORLD (failfast)
GROUP_TAG = 7304    # new_group's rank-list check, on a world duplicate (rendezvous)
