"""The layouts of the Legendre tables of ``sht_torch.TorchSHT``: Legendre sums over the degree l for all orders m.

Per order m a Legendre transform is a matrix product with the tables of ``legendre.legendre_tables``
(Pbar, dPbar/dtheta, m Pbar/sin theta), on real rows (R, M, lmax + 1) <-> (R, M, n).  The tables have three
layouts with one interface, chosen by ``default_layout`` from what benchmarks/sht_backends.py measured:

* dense [m, l, j] (``DenseLegendre``): one batched matmul; small grids (below lmax 48 on the CPU,
  64 on CUDA), where the others' fixed costs dominate and its memory is small (3 x 3 MiB at lmax 63).
* packed (``PackedLegendre``): folded about the equator by parity, and triangular, orders m and
  lmax - m sharing one matrix, so a quarter of the dense numbers and of the memory the matmuls read
  (at one or a few fields the Legendre sums are memory-bound), at the price of about ten small
  gather / fold kernels per sum; CUDA from lmax 64, and the CPU above lmax 256.
* sparse (``SparseLegendre``): the parity fold as one CSR matrix over (g, m, j) x (m, l), whose
  product takes the coefficients in their own layout (no gather or scatter) and streams the table
  through MKL's sparse kernel, where the batched matmul of the packed tables (4-row products) ran at
  a third of the table's streaming rate; the CPU from lmax 48 to 256 (1.25-1.9x the packed speed).
"""

import warnings

import numpy as np
import torch

# Layout crossovers of the Legendre tables (default_layout), measured on one CPU thread; on CUDA the
# packed layout keeps the CPU's old crossover (the GPU step is launch-bound, see results/).
PACKED_FROM_LMAX = 64
SPARSE_FROM_LMAX = 48
SPARSE_UP_TO_LMAX = 256


class PackedLegendre:
    """Legendre sums over the degree l, for all orders m at once, at nodes symmetric about the equator.

    The nodes satisfy x_{n-1-j} = -x_j (Gauss nodes, or equispaced colatitudes including both
    poles).  Pbar_lm(-x) = (-1)^(l+m) Pbar_lm(x), and the same holds for m Pbar_lm / sin(theta),
    while dPbar_lm/dtheta has the opposite parity (-1)^(l+m+1).  A sum over l therefore splits
    into its terms with l + m even and those with l + m odd (the parity group g = (l + m) % 2);
    one is even in x (sym), the other odd (anti), and with both evaluated on the ceil(n/2)
    northern nodes

        f(x_j) = sym_j + anti_j,   f(x_{n-1-j}) = sym_j - anti_j.

    Analysis is the transpose: the rings are folded into sym = f_j + f_{n-1-j} and
    anti = f_j - f_{n-1-j} (the equator node, for odd n, counted once).

    Triangular packing: order m has lmax + 1 - m degrees, so orders m and lmax - m together
    have lmax + 2.  Each pair p = (p, lmax - p) and group g gets one table [k, j] holding the
    rows l = m + g, m + g + 2, ... of its first order, then those of its second, zero-padded to
    a common length K ~ lmax / 2 + 2; the rows of the two orders are multiplied by the same
    table with zeros in the other order's slots.  Stored shape [pair, g, k, northern j]:
    about (lmax + 1)^2 n / 4 numbers, a quarter of the dense [m, l, j] table.

    Fields are real rows (R, M, ...) with M = lmax + 1 orders: coefficients (R, M, lmax + 1)
    indexed [., m, l] (zero for l < m), grid values (R, M, n).
    """

    def __init__(self, lmax: int, nlat: int, device=torch.device("cpu")):
        self.lmax, self.nlat = lmax, nlat
        self.north, self.south = (nlat + 1) // 2, nlat // 2
        nmode = lmax + 1
        pairs = (lmax + 2) // 2
        order = np.stack([np.arange(pairs), lmax - np.arange(pairs)], axis=1)  # (P, s): the two orders of a pair
        segments = [[[np.arange(order[p, s] + g, lmax + 1, 2) if s == 0 or order[p, 1] != order[p, 0]
                      else np.arange(0) for s in range(2)] for g in range(2)] for p in range(pairs)]
        self.rows = max(len(seg[0]) + len(seg[1]) for pair in segments for seg in pair)
        # Slot (p, g, s, k) -> (order, degree), or -1 where order s of pair p has no degree at slot k.
        self._order = np.full((pairs, 2, 2, self.rows), -1)
        self._degree = np.full((pairs, 2, 2, self.rows), -1)
        for p in range(pairs):
            for g in range(2):
                first, second = segments[p][g]
                self._order[p, g, 0, : len(first)], self._degree[p, g, 0, : len(first)] = order[p, 0], first
                slots = slice(len(first), len(first) + len(second))
                self._order[p, g, 1, slots], self._degree[p, g, 1, slots] = order[p, 1], second
        valid = self._degree >= 0
        # Flat index into coefficients (R, M, lmax + 2) whose last column is zero; invalid slots read
        # (and, in analysis, dump into) that column.
        flat = np.where(valid, self._order * (lmax + 2) + self._degree, lmax + 1)
        self._flat = torch.as_tensor(flat.reshape(-1), device=device)
        # Grid rows: order m is slot s of pair p, i.e. row 2 p + s of the (R, 2 P, n) result.
        slot_of_order = np.empty(nmode, dtype=np.int64)
        slot_of_order[order[:, 1]] = 2 * np.arange(pairs) + 1
        slot_of_order[order[:, 0]] = 2 * np.arange(pairs)
        self._slot_of_order = torch.as_tensor(slot_of_order, device=device)
        self._order_of_slot = torch.as_tensor(order.reshape(-1), device=device)

    def pack(self, table: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
        """A table [m, l, j] over all n nodes -> packed [pair, g, k, j] over the northern nodes (s merged in k)."""
        valid = self._degree >= 0
        values = np.where(valid[..., None],
                          table[np.maximum(self._order, 0), np.maximum(self._degree, 0), : self.north],
                          0.0)  # (P, g, s, K, north): each slot holds one order's row, the other order's slot is 0
        return torch.as_tensor(values.sum(axis=2), dtype=dtype, device=device)

    def synthesis(self, coeffs: torch.Tensor, table: torch.Tensor, odd: bool) -> torch.Tensor:
        """sum_l coeffs[r, m, l] T_lm(x_j): real (R, M, lmax+1) -> (R, M, n); `odd` for dPbar/dtheta."""
        count, pairs = coeffs.shape[0], table.shape[0]
        padded = torch.nn.functional.pad(coeffs, (0, 1)).reshape(count, -1)
        gathered = padded[:, self._flat].view(count, pairs, 2, 2, self.rows)  # (R, P, g, s, K)
        gathered = gathered.permute(1, 2, 3, 0, 4).reshape(pairs, 2, 2 * count, self.rows)
        parts = torch.matmul(gathered, table)  # (P, g, s R, north)
        sym, anti = (parts[:, 1], parts[:, 0]) if odd else (parts[:, 0], parts[:, 1])
        grid = torch.cat((sym + anti, (sym - anti)[..., : self.south].flip(-1)), dim=-1)  # (P, s R, n)
        grid = grid.view(pairs, 2, count, self.nlat).permute(2, 0, 1, 3).reshape(count, 2 * pairs, self.nlat)
        return grid.index_select(1, self._slot_of_order)

    def analysis(self, rings: torch.Tensor, table: torch.Tensor, odd: bool) -> torch.Tensor:
        """sum_j rings[r, m, j] T_lm(x_j): real (R, M, n) -> (R, M, lmax+1); `odd` for dPbar/dtheta."""
        count, pairs = rings.shape[0], table.shape[0]
        north = rings[..., : self.north]
        south = torch.nn.functional.pad(rings[..., self.north:].flip(-1), (0, self.north - self.south))
        groups = (north - south, north + south) if odd else (north + south, north - south)  # g = 0, 1
        folded = torch.stack(groups).index_select(2, self._order_of_slot)  # (g, R, P s, north)
        # table @ rings (K x north times north x s R) keeps both operands contiguous: with the table
        # transposed instead, the matmul runs ~3x slower on the CPU.
        folded = folded.view(2, count, pairs, 2, self.north).permute(2, 0, 4, 3, 1).reshape(pairs, 2, self.north,
                                                                                          2 * count)
        parts = torch.matmul(table, folded)  # (P, g, K, s R)
        parts = parts.view(pairs, 2, self.rows, 2, count).permute(4, 0, 1, 3, 2).reshape(count, -1)
        out = rings.new_zeros(count, (self.lmax + 1) * (self.lmax + 2))
        out.scatter_(1, self._flat.expand(count, -1), parts)
        return out.view(count, self.lmax + 1, self.lmax + 2)[..., : self.lmax + 1]


class DenseLegendre:
    """Legendre sums over the degree l with dense tables [m, l, j]: one batched matmul over the orders.

    Same interface as ``PackedLegendre`` (real rows (R, M, lmax + 1) <-> (R, M, n)); `odd` is unused,
    the tables holding every node.  Memory (lmax + 1)^2 n numbers per table.
    """

    def __init__(self, lmax: int, nlat: int, device=torch.device("cpu")):
        self.lmax, self.nlat = lmax, nlat

    def pack(self, table: np.ndarray, dtype: torch.dtype, device) -> torch.Tensor:
        return torch.as_tensor(table, dtype=dtype, device=device)

    def synthesis(self, coeffs: torch.Tensor, table: torch.Tensor, odd: bool) -> torch.Tensor:
        # Batch rows on the left of the table: (M, R, L) @ (M, L, n) runs ~2x faster on the CPU than
        # the transposed product.
        return torch.matmul(coeffs.transpose(0, 1), table).transpose(0, 1)

    def analysis(self, rings: torch.Tensor, table: torch.Tensor, odd: bool) -> torch.Tensor:
        return torch.matmul(rings.transpose(0, 1), table.transpose(1, 2)).transpose(0, 1)


class SparseLegendre:
    """Legendre sums over the degree l as one sparse matrix product for all orders (CPU layout).

    The parity fold of ``PackedLegendre`` without its packing: the table T_lm(x_j) on the northern nodes
    is one CSR matrix S with a row per (g, m, j) (g = (l + m) % 2, the parity group) and a column per
    (m, l), so that the sums of every order are S @ coefficients[(m, l), r] at once, and the analysis
    is S^T (stored too: torch multiplies a transposed CSR, i.e. CSC, matrix ~60x slower on the CPU).
    The coefficients' own [m, l] layout is the product's right-hand side, so no gather, scatter or
    zero padding is needed, and MKL's sparse product streams the table (about (lmax + 1)^2 nlat / 4
    values and int32 column indices per matrix: 12 bytes a value, 3x the packed layout's memory
    with both S and S^T).  On one CPU thread this is 1.25-1.9x faster than the packed layout and
    1.6-2.9x faster than the dense one from lmax 48 to 256, slower below (benchmarks/sht_backends.py).
    Same interface as ``PackedLegendre``; the "table" is the pair (S, S^T).
    """

    def __init__(self, lmax: int, nlat: int, device=torch.device("cpu")):
        self.lmax, self.nlat = lmax, nlat
        self.north, self.south = (nlat + 1) // 2, nlat // 2

    def pack(self, table: np.ndarray, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        """A table [m, l, j] over all n nodes -> (S, S^T) in CSR with int32 indices (class docstring)."""
        nmode, north = self.lmax + 1, self.north
        m, l = np.meshgrid(np.arange(nmode), np.arange(nmode), indexing="ij")
        m, l = m[l >= m], l[l >= m]
        j = np.arange(north)
        rows = ((((l + m) % 2) * nmode + m)[:, None] * north + j[None, :]).ravel()
        columns = np.repeat(m * nmode + l, north)
        values = table[m[:, None], l[:, None], j[None, :]].ravel()
        shape = (2 * nmode * north, nmode * nmode)

        def csr(rows: np.ndarray, columns: np.ndarray, shape: tuple) -> torch.Tensor:
            order = np.lexsort((columns, rows))
            starts = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=shape[0]))])
            with warnings.catch_warnings():  # torch's notice that CSR support is "in beta", at every construction
                warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
                return torch.sparse_csr_tensor(
                    torch.as_tensor(starts, dtype=torch.int32), torch.as_tensor(columns[order], dtype=torch.int32),
                    torch.as_tensor(values[order], dtype=dtype), shape, check_invariants=True).to(device)

        return csr(rows, columns, shape), csr(columns, rows, shape[::-1])

    def synthesis(self, coeffs: torch.Tensor, table: tuple, odd: bool) -> torch.Tensor:
        """sum_l coeffs[r, m, l] T_lm(x_j): real (R, M, lmax+1) -> (R, M, n); `odd` for dPbar/dtheta."""
        count, nmode = coeffs.shape[0], self.lmax + 1
        parts = (table[0] @ coeffs.reshape(count, -1).T).view(2, nmode, self.north, count)
        sym, anti = (parts[1], parts[0]) if odd else (parts[0], parts[1])
        grid = torch.cat((sym + anti, (sym - anti)[:, : self.south].flip(1)), dim=1)  # (M, n, R)
        return grid.permute(2, 0, 1)

    def analysis(self, rings: torch.Tensor, table: tuple, odd: bool) -> torch.Tensor:
        """sum_j rings[r, m, j] T_lm(x_j): real (R, M, n) -> (R, M, lmax+1); `odd` for dPbar/dtheta."""
        count, nmode = rings.shape[0], self.lmax + 1
        north = rings[..., : self.north]
        south = torch.nn.functional.pad(rings[..., self.north:].flip(-1), (0, self.north - self.south))
        groups = (north - south, north + south) if odd else (north + south, north - south)  # g = 0, 1
        folded = torch.stack(groups).permute(0, 2, 3, 1).reshape(-1, count)  # rows (g, m, j)
        return (table[1] @ folded).T.reshape(count, nmode, nmode)


LAYOUTS = {"dense": DenseLegendre, "packed": PackedLegendre, "sparse": SparseLegendre}


def default_layout(lmax: int, device: torch.device) -> str:
    """The Legendre-table layout measured fastest (benchmarks/sht_backends.py): on the CPU dense below
    lmax = SPARSE_FROM_LMAX, sparse up to SPARSE_UP_TO_LMAX (its memory, 3x packed, is 0.43 GiB there in
    float64), packed beyond; on CUDA dense below PACKED_FROM_LMAX, packed from there."""
    if torch.device(device).type != "cpu":
        return "packed" if lmax >= PACKED_FROM_LMAX else "dense"
    if lmax < SPARSE_FROM_LMAX:
        return "dense"
    return "sparse" if lmax <= SPARSE_UP_TO_LMAX else "packed"


def table_bytes(table) -> int:
    """Memory of a stored table: a dense tensor, or the (S, S^T) pair of CSR matrices."""
    if isinstance(table, tuple):
        return sum(t.values().nbytes + t.col_indices().nbytes + t.crow_indices().nbytes for t in table)
    return table.numel() * table.element_size()
