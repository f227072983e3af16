"""A dict of the few latest answers a search asks again, each a whole model's trace or a
plan's: kept, but not all of them (they are large)."""


class Recent(dict):
    """A dict keeping its last two entries.

    >>> r = Recent()
    >>> r[1], r[2], r[3] = "a", "b", "c"
    >>> sorted(r)
    [2, 3]
    """

    def __setitem__(self, key, value):
        while len(self) >= 2:
            self.pop(next(iter(self)))
        super().__setitem__(key, value)
