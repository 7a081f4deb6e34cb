/* The score of boosted regression trees (xmc.lexical.hybrid.BoostedTreesFusion) for each row of a feature matrix:
 *   out[i] = baseline + value[leaf_0(x_i)] + value[leaf_1(x_i)] + ...   (added in tree order)
 * A node with feature < 0 is a leaf; elsewhere x goes left when x[feature] <= threshold, a NaN where missing_left
 * says. The trees are concatenated: tree t's nodes start at tree_start[t], its children are indices within the tree.
 * The numpy path walks one tree at a time over all rows and adds the trees in the same order, so the two give the
 * same doubles (tested); here a row walks every tree while it sits in cache, without a numpy call per tree level.
 */
#include <math.h>
#include <stdint.h>

void xmc_trees_score(const double *X, int64_t n_rows, int64_t n_features, const int64_t *feature,
                     const double *threshold, const uint8_t *missing_left, const int64_t *left, const int64_t *right,
                     const double *value, const int64_t *tree_start, int64_t n_trees, double baseline, double *out) {
    for (int64_t i = 0; i < n_rows; ++i) {
        const double *x = X + i * n_features;
        double acc = baseline;
        for (int64_t t = 0; t < n_trees; ++t) {
            const int64_t o = tree_start[t];
            int64_t node = 0;
            while (feature[o + node] >= 0) {
                const double v = x[feature[o + node]];
                const int go_left = isnan(v) ? missing_left[o + node] != 0 : v <= threshold[o + node];
                node = go_left ? left[o + node] : right[o + node];
            }
            acc += value[o + node];
        }
        out[i] = acc;
    }
}
