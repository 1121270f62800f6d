"""Persistence: every verification and every person's disposition of one, in SQL.

`tables` holds the SQLModel tables (and nothing else), `engine` opens the database and checks
its schema version at start-up, `repository` reads and writes rows and syncs the index from
transcript folders. Only commands that need the database import this package: the embedded
`gate` path never does.
"""
