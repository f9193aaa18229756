"""The steady-state benchmark's parts: one configuration's run (:mod:`.runs`), the result (:mod:`.report`)."""
