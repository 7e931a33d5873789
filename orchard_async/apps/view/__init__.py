"""``orchard-async view``: a run's trajectories in the browser.

* ``index``: one scan of a trajectory file into per-episode columns and record offsets
  (pages decode only the records they show), and the run's summary, equal to ``inspect``'s;
* ``query``: filters, sorting, paging, an episode in full, a group, two runs per task;
* ``app``: the aiohttp app (JSON API, the page's assets in ``static/``, files only from the
  run's folder);
* ``cli``: the command (``add_view_command``, registered in ``orchard_async.commands``);
* ``measure``: first-load time and server memory on a large synthetic run.
"""
