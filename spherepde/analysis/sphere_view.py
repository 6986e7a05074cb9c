"""A run on S^2 drawn: its density, re-synthesised from the spectral series, and its saved particles, in
orthographic views of both hemispheres or in the Mollweide projection.

The density is sampled bilinearly from a fine grid of at least FINE_NLAT latitudes (band-limited interpolation:
the function the solver represents, not a faceted grid).  An orthographic view centred on the unit vector c has
the screen frame e1 (right, eastward), e2 (up, northward), e3 = c: the pixel (x, y) of the disk x^2 + y^2 <= 1
shows the point x e1 + y e2 + sqrt(1 - x^2 - y^2) e3 of the visible hemisphere.  The two views are centred on
the final mean direction and its antipode, with a graticule every 30 degrees.
"""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import PowerNorm  # noqa: E402

from spherepde.base.errors import CaseError  # noqa: E402
from spherepde.io.output import BOTH_PREFIX  # noqa: E402

CMAP = "magma"
PIXELS = 321  # orthographic disk resolution
FINE_NLAT = 180  # the re-synthesised grid has at least this many latitudes (1 degree)
MAX_PARTICLES_DRAWN = 2000


def drawn(count: int) -> slice:
    """The saved particles a figure draws of `count`: at most MAX_PARTICLES_DRAWN, evenly strided, so that they
    come from every replica system (the saved tokens run system by system: particle_recorder.saved_tokens)."""
    return slice(None, None, max(1, -(-count // MAX_PARTICLES_DRAWN)))


def _final_mean(dataset, dim: int) -> np.ndarray:
    """The mean position at the last save that has one (a failed run of a "both" file is NaN after its failure:
    the other run's then), or 0."""
    for name in ("mean", BOTH_PREFIX + "mean"):
        if name in dataset:
            values = dataset[name].values
            finite = np.flatnonzero(np.isfinite(values).all(axis=1))
            if finite.size:
                return values[finite[-1]]
    return np.zeros(dim)


def _view_centre(dataset) -> tuple[np.ndarray, str]:
    """(the unit vector the views centre on, what it is): the final mean direction; where the mean vanishes (a
    symmetric law, antipodal clusters) the grid point of the last saved density's maximum, so that a cluster faces
    the viewer; without a density the north pole."""
    mean = _final_mean(dataset, 3)
    if np.linalg.norm(mean) > 1e-6:
        return mean / np.linalg.norm(mean), "the final mean"
    saved = [index for index in range(dataset.sizes["time"]) if _has_density(dataset, index)]
    if saved:
        values = dataset["density"].isel(time=saved[-1])
        lat, lon = (np.radians(float(values[name][index])) for name, index in
                    zip(("lat", "lon"), np.unravel_index(int(np.argmax(values.values)), values.shape)))
        return np.array([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)]), "the density's maximum"
    return np.array([0.0, 0.0, 1.0]), "the north pole"


def _has_density(dataset, index: int) -> bool:
    """Whether save `index` has a density (not the NaN padding after a failed Eulerian run of a "both" file)."""
    return "density" in dataset and bool(np.isfinite(dataset["density"].isel(time=index).values).all())


class SphereDensity:
    """The density of a result on S^2, re-synthesised on a fine grid and sampled at any point."""

    def __init__(self, dataset, path: str):
        # imported here, not with the module, which every figure imports: torch (the basis's) costs 1.2 s of CPU, a
        # quarter of `spherepde plot` of a run on S^1 or of a sweep, which draw no sphere
        from spherepde.base.device import placement
        from spherepde.discretisation.bases import make_basis

        self.path = path
        fine_lmax = max(int(dataset.attrs["lmax"]), math.ceil(2 * FINE_NLAT / 3))
        self.basis = make_basis(3, fine_lmax, placement("cpu", "float64"), vector=False)  # values, no derivatives
        lat = self.basis.latitude.numpy()
        self.order = np.argsort(lat)  # Gauss latitudes run north to south; the interpolator wants them ascending
        self.lat = np.concatenate([[-90.0], lat[self.order], [90.0]])
        self.lon = np.append(self.basis.longitude.numpy(), 360.0)
        self.poles = self.basis.placement.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0]])
        self.cached = (None, None, None)  # (save index, interpolator of its fine grid, that grid's maximum)

    def grid(self, index: int) -> np.ndarray:
        """(lat, lon) values on the fine grid, poles and the 360-degree column added."""
        from spherepde.model.initial import density_from_file  # torch's, as in __init__

        try:
            c = density_from_file(self.path, int(index), self.basis)
        except CaseError as error:  # the reader of initial densities: its words, but not its case key
            raise CaseError(f"plot: {str(error).removeprefix('initial.path: ')}") from None
        values = self.basis.synthesis(c).numpy()[self.order]
        poles = self.basis.evaluate(c, self.poles).numpy()
        values = np.concatenate([np.full((1, values.shape[1]), poles[0]), values,
                                 np.full((1, values.shape[1]), poles[1])])
        return np.concatenate([values, values[:, :1]], axis=1)

    def _fine(self, index: int) -> tuple:
        """(save index, interpolator, maximum) of the fine grid of save `index`, kept for the next call."""
        from scipy.interpolate import RegularGridInterpolator  # 0.35 s of CPU, for spheres alone as torch

        if self.cached[0] != index:
            values = self.grid(index)
            self.cached = (index, RegularGridInterpolator((self.lat, self.lon), values), float(values.max()))
        return self.cached

    def sample(self, index: int, lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
        """Bilinear samples of the fine grid of save `index` at (lat, lon) in degrees."""
        return self._fine(index)[1](np.stack([lat, np.mod(lon, 360.0)], axis=-1))

    def maximum(self, index: int) -> float:
        """The largest value of save `index` on the fine grid: the largest that `sample` returns."""
        return self._fine(index)[2]


def _view_frame(centre: np.ndarray) -> np.ndarray:
    """Rows e1 (screen right, eastward), e2 (screen up, northward), e3 = centre (towards the viewer)."""
    e3 = centre / np.linalg.norm(centre)
    north = np.array([0.0, 0.0, 1.0]) if abs(e3[2]) < 0.99 else np.array([1.0, 0.0, 0.0])
    e2 = north - (north @ e3) * e3
    e2 /= np.linalg.norm(e2)
    return np.stack([np.cross(e2, e3), e2, e3])


def _disk_points(frame: np.ndarray, pixels: int = PIXELS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Latitude, longitude (degrees) of the visible hemisphere at each pixel, and the disk mask."""
    u = np.linspace(-1, 1, pixels)
    x, y = np.meshgrid(u, u)
    inside = x ** 2 + y ** 2 <= 1
    z = np.sqrt(np.clip(1 - x ** 2 - y ** 2, 0, None))
    points = x[..., None] * frame[0] + y[..., None] * frame[1] + z[..., None] * frame[2]
    lat = np.degrees(np.arcsin(np.clip(points[..., 2], -1, 1)))
    lon = np.degrees(np.arctan2(points[..., 1], points[..., 0]))
    return lat, lon, inside


def _graticule(axis, frame: np.ndarray, colour: str, step: int = 30) -> None:
    """Parallels and meridians every `step` degrees on the visible side, and the limb."""
    s = np.radians(np.linspace(-180, 180, 361))
    lines = [np.stack([np.cos(np.radians(lat)) * np.cos(s), np.cos(np.radians(lat)) * np.sin(s),
                       np.full_like(s, np.sin(np.radians(lat)))], -1) for lat in range(-90 + step, 90, step)]
    t = np.radians(np.linspace(-90, 90, 181))
    lines += [np.stack([np.cos(t) * np.cos(np.radians(lon)), np.cos(t) * np.sin(np.radians(lon)), np.sin(t)], -1)
              for lon in range(0, 360, step)]
    for line in lines:
        projected = line @ frame.T
        x, y = projected[:, 0].copy(), projected[:, 1].copy()
        x[projected[:, 2] < 0], y[projected[:, 2] < 0] = np.nan, np.nan
        axis.plot(x, y, color=colour, lw=0.4, alpha=0.35)
    limb = np.linspace(0, 2 * np.pi, 361)
    axis.plot(np.cos(limb), np.sin(limb), color="0.25", lw=0.8)


def _lat_lon_label(vector: np.ndarray) -> str:
    """A unit vector as "(latitude°, longitude°)"."""
    lat = math.degrees(math.asin(max(-1.0, min(1.0, vector[2]))))
    lon = math.degrees(math.atan2(vector[1], vector[0])) % 360
    return f"({lat:.0f}°, {lon:.0f}°)"


class SphereView:
    """One way of drawing a run on S^2 (its density, its particles or both): orthographic front
    and back disks, or Mollweide."""

    def __init__(self, dataset, path: str, projection: str):
        self.density = SphereDensity(dataset, path) if "density" in dataset else None
        self.saved = [_has_density(dataset, index) for index in range(dataset.sizes["time"])]
        self.projection = projection
        self.particles = dataset["particles"].values if "particles" in dataset else None
        self.centre, self.centred_on = _view_centre(dataset)
        self.frames = [_view_frame(self.centre), _view_frame(-self.centre)]
        # one square-root scale for the whole run (animations), or each save's own (snapshots: a broad initial law
        # is invisible on the scale of the cluster it becomes)
        if self.density:  # a failed run's saves after its failure are NaN: their maxima -inf, never drawn
            values = dataset["density"].values.reshape(dataset.sizes["time"], -1)
            self.maxima = np.where(np.isfinite(values), values, -np.inf).max(axis=1)
        self.norm = PowerNorm(0.5, 0.0, float(self.maxima.max())) if self.density else None
        self.own_scale = False
        self.dots = "cyan" if self.density else "C0"
        if projection == "orthographic":
            self.disks = [_disk_points(frame) for frame in self.frames]
        else:
            lon = np.linspace(-180, 180, 2 * FINE_NLAT + 1)
            lat = np.linspace(-90, 90, FINE_NLAT + 1)
            self.mollweide = np.meshgrid(np.radians(lon), np.radians(lat))
            self.lat_lon = np.meshgrid(lon, lat)[::-1]

    @property
    def panels(self) -> int:
        """Axes per snapshot: 2 disks or 1 map."""
        return 2 if self.projection == "orthographic" else 1

    def axes_kwargs(self) -> dict:
        """Keyword arguments of the axes the view draws into."""
        return {"projection": "mollweide"} if self.projection == "mollweide" else {}

    def scale(self, index: int) -> PowerNorm:
        """The colour scale of save `index`: with `own_scale` its own, 0 to the largest value drawn, which
        `maxima[index]` then holds (the titles'), else the run's."""
        if not self.own_scale:
            return self.norm
        return PowerNorm(0.5, 0.0, self._drawn_peak(index))

    def _drawn_peak(self, index: int) -> float:
        """maxima[index] raised to the largest value drawn of save `index`, its fine grid's: the solver's grid misses
        the peaks between its nodes (a cluster at lmax 24: 10.9 against the fine grid's 12.3), and on a scale that
        stopped there the top of each peak was one flat colour and the title understated its maximum."""
        self.maxima[index] = max(self.maxima[index], self.density.maximum(index))
        return float(self.maxima[index])

    def scale_to_drawn_peaks(self) -> None:
        """The run's scale (animations) up to the largest value drawn over all saves (`_drawn_peak`): a colour bar
        that stopped at the solver's grid's largest value cut the peaks of the frames flat.  One more fine grid a
        save (0.15-0.3 s)."""
        if self.density:
            for index in np.flatnonzero(self.saved):
                self._drawn_peak(index)
            self.norm = PowerNorm(0.5, 0.0, float(self.maxima.max()))

    def draw(self, axes: list, index: int) -> None:
        """Draw save `index` into `axes` (`panels` of them)."""
        lines = "white" if self.density else "0.5"
        if self.projection == "orthographic":
            for axis, (lat, lon, inside), frame in zip(axes, self.disks, self.frames):
                if self.density and self.saved[index]:
                    image = np.ma.masked_where(~inside, self.density.sample(index, lat, lon))
                    # the samples are the pixels' centres (`_disk_points`): the image reaches half a pixel beyond
                    # them, else it was shrunk by a pixel against the graticule, the limb and the particles
                    edge = 1 + 1 / (PIXELS - 1)
                    axis.imshow(image, origin="lower", extent=(-edge, edge, -edge, edge), cmap=CMAP,
                                norm=self.scale(index), interpolation="bilinear")
                else:
                    axis.add_patch(plt.Circle((0, 0), 1, color="0.95"))
                _graticule(axis, frame, lines)
                axis.set_xlim(-1.02, 1.02)
                axis.set_ylim(-1.02, 1.02)
                axis.set_aspect("equal")
                axis.axis("off")
                if self.particles is not None:
                    projected = self.particles[index, drawn(self.particles.shape[1])] @ frame.T
                    front = projected[:, 2] >= 0
                    axis.scatter(projected[front, 0], projected[front, 1], s=3, c=self.dots, lw=0, alpha=0.8)
            return
        axis = axes[0]
        if self.density and self.saved[index]:
            axis.pcolormesh(*self.mollweide, self.density.sample(index, *self.lat_lon), cmap=CMAP,
                            norm=self.scale(index), shading="gouraud", rasterized=True)
        else:
            axis.set_facecolor("0.95")
        # the graticule labelled in longitudes in [0, 360), the file's and the orthographic views' centres': an
        # unlabelled map did not say where longitude 0 is nor which way is east
        longitudes, latitudes = np.arange(-150, 180, 30), np.arange(-60, 90, 30)
        axis.set_xticks(np.radians(longitudes), [f"{lon % 360}°" if lon % 60 == 0 else "" for lon in longitudes],
                        fontsize=6, color="0.6")
        axis.set_yticks(np.radians(latitudes), [f"{lat}°" for lat in latitudes], fontsize=6)
        axis.grid(True, color=lines, lw=0.4, alpha=0.35)
        if self.particles is not None:
            x = self.particles[index, drawn(self.particles.shape[1])]
            axis.scatter(np.arctan2(x[:, 1], x[:, 0]), np.arcsin(np.clip(x[:, 2], -1, 1)), s=3, c=self.dots, lw=0,
                         alpha=0.8)

    def labels(self) -> list[str]:
        """What each of the `panels` axes shows."""
        if self.projection == "orthographic":
            return [f"centred on {self.centred_on} {_lat_lon_label(self.centre)}",
                    f"opposite side {_lat_lon_label(-self.centre)}"]
        return ["Mollweide"]
