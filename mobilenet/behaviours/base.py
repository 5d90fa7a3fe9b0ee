"""A behaviour: each of the run's named points does nothing unless the behaviour defines it."""


class Behaviour:
    def at_start(self, r):
        return None

    def at_resume(self, r, path, checkpoint):
        return None

    def at_log(self, r, interval):
        pass

    def at_epoch_end(self, r, results):
        pass
