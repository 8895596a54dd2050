"""A scikit-learn pipeline with cross-validation, as a modelling notebook runs it.

A synthetic regression/classification table (150k rows, 40 features) goes
through a Pipeline (imputation, scaling, a polynomial expansion of a few
columns, a linear model) evaluated with 5-fold cross-validation, then a
small grid search over the regularisation, then a random forest on a sample.
scikit-learn copies its inputs at many steps (check_array, the imputer, the
scaler, the fold splits), which is the memory pattern measured here.

Seeded and single-threaded (n_jobs=1); prints scores rounded to 10 digits
and a SHA-256 of the final predictions, so the output is byte-identical to
a plain run.
"""
import hashlib

import numpy as np
from sklearn.compose import ColumnTransformer
from sklearn.ensemble import RandomForestClassifier
from sklearn.impute import SimpleImputer
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import PolynomialFeatures, StandardScaler

ROWS, FEATURES = 150_000, 40
rng = np.random.default_rng(5)
X = rng.normal(size=(ROWS, FEATURES))
X[rng.random(X.shape) < 0.02] = np.nan
w = rng.normal(size=FEATURES)
y = np.nan_to_num(X) @ w + rng.normal(scale=0.5, size=ROWS)
y_cls = (y > np.median(y)).astype(np.int64)

prep = ColumnTransformer([
    ("poly", Pipeline([("imp", SimpleImputer()), ("poly", PolynomialFeatures(2, include_bias=False))]),
     list(range(4))),
    ("rest", Pipeline([("imp", SimpleImputer(strategy="median")), ("sc", StandardScaler())]),
     list(range(4, FEATURES))),
])
model = Pipeline([("prep", prep), ("ridge", Ridge(alpha=1.0))])
folds = KFold(5, shuffle=True, random_state=0)
scores = cross_val_score(model, X, y, cv=folds, scoring="r2", n_jobs=1)
print("ridge cv", [round(float(s), 10) for s in scores])

grid = GridSearchCV(model, {"ridge__alpha": [0.1, 10.0]}, cv=KFold(3, shuffle=True, random_state=1),
                    scoring="r2", n_jobs=1)
grid.fit(X, y)
print("grid", grid.best_params_, round(float(grid.best_score_), 10))

clf = Pipeline([("imp", SimpleImputer()), ("sc", StandardScaler()),
                ("lr", LogisticRegression(max_iter=200))])
acc = cross_val_score(clf, X, y_cls, cv=KFold(4, shuffle=True, random_state=2), n_jobs=1)
print("logistic cv", [round(float(a), 10) for a in acc])

idx = rng.choice(ROWS, 30_000, replace=False)
forest = Pipeline([("imp", SimpleImputer()),
                   ("rf", RandomForestClassifier(n_estimators=20, max_depth=12, random_state=3, n_jobs=1))])
forest.fit(X[idx], y_cls[idx])
pred = forest.predict_proba(X[:50_000])
print("forest", hashlib.sha256(np.round(pred, 12).tobytes()).hexdigest()[:16])
