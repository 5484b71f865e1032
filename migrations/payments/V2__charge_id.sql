-- The card provider's id for the charge this payment records (ch_…): the same id the
-- provider lists for the order, which is how a person (and the fault suite) matches one
-- payment to one charge. Null only on payments recorded before there was a provider.
ALTER TABLE payments ADD COLUMN charge_id text;
