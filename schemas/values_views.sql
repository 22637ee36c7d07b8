-- Views over one values folder (tokencredit values RUN --out DIR); {values} and {decisive} are replaced by
-- table expressions over its part files (pipeline/values.py: connect_values).
CREATE OR REPLACE VIEW "values" AS
    SELECT * FROM {values};

CREATE OR REPLACE VIEW decisive AS
    SELECT * FROM {decisive};

-- One row per (response, reward): its curve as lists in position order, and the decisive segment.
CREATE OR REPLACE VIEW curves AS
    SELECT v.response_id, v.reward, v.constraint_index,
           list(v.position ORDER BY v.position) AS positions,
           list(v.value ORDER BY v.position) AS curve,
           list(v.stderr ORDER BY v.position) AS stderrs,
           any_value(d.failed) AS failed, any_value(d.start) AS decisive_start, any_value(d."end") AS decisive_end,
           any_value(d.change) AS decisive_change
    FROM "values" v LEFT JOIN decisive d
      ON d.response_id = v.response_id AND d.reward = v.reward
     AND d.constraint_index IS NOT DISTINCT FROM v.constraint_index
    GROUP BY v.response_id, v.reward, v.constraint_index;
