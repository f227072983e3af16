"""A dict of the few latest answers a search asks again, each a whole model's trace or a
plan's: kept, but not all of them (they are large)."""


class Recent(dict):
    """A dict keeping its last ``size`` entries (two by default).

    >>> r = Recent()
    >>> r[1], r[2], r[3] = "a", "b", "c"
    >>> sorted(r)
    [2, 3]
    >>> r = Recent(3)
    >>> r[1], r[2], r[3], r[4] = "a", "b", "c", "d"
    >>> sorted(r)
    [2, 3, 4]
    """

    def __init__(self, size: int = 2):
        super().__init__()
        self.size = size

    def __setitem__(self, key, value):
        while len(self) >= self.size:
            self.pop(next(iter(self)))
        super().__setitem__(key, value)
